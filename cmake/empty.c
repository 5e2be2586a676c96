/* Stands in for a core area that has no sources yet. */
typedef int tsr_empty_translation_unit;
