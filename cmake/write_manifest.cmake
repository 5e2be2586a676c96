# cmake -DLIB=lib.so -DIN=manifest.yaml -DOUT=catalog/manifest.yaml -P write_manifest.cmake
file(SHA256 ${LIB} _sha)
file(READ ${IN} _text)
string(REPLACE "@SHA256@" "${_sha}" _text "${_text}")
file(WRITE ${OUT}.tmp "${_text}")
file(RENAME ${OUT}.tmp ${OUT})
