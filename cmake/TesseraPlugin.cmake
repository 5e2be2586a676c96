# tessera_add_plugin(NAME SOURCES src... [MANIFEST path] [LIBS libs...] [TEST])
#
# Builds plugin NAME as a shared object in the catalog folder (build/catalog),
# hidden visibility, linked against the kernels library only (plugins never
# link against the host), and writes the catalog manifest next to it: the
# source manifest (default manifests/NAME.yaml) with @SHA256@ replaced by the
# library's sha256, computed after every link. TEST plugins go to
# build/tests/catalog instead and never into the engine's catalog.
function(tessera_add_plugin NAME)
  cmake_parse_arguments(P "TEST" "MANIFEST;CATALOG" "SOURCES;LIBS" ${ARGN})
  if(NOT P_MANIFEST)
    set(P_MANIFEST ${CMAKE_SOURCE_DIR}/manifests/${NAME}.yaml)
  endif()
  if(NOT P_CATALOG)
    if(P_TEST)
      set(P_CATALOG ${CMAKE_BINARY_DIR}/tests/catalog)
    else()
      set(P_CATALOG ${TESSERA_CATALOG_DIR})
    endif()
  endif()
  add_library(${NAME} MODULE ${P_SOURCES})
  set_target_properties(${NAME} PROPERTIES
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${P_CATALOG}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden)
  target_include_directories(${NAME} PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(${NAME} PRIVATE tsr_kernels ${P_LIBS})
  get_filename_component(_mname ${P_MANIFEST} NAME)
  add_custom_command(TARGET ${NAME} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:${NAME}> -DIN=${P_MANIFEST}
            -DOUT=${P_CATALOG}/${_mname} -P ${CMAKE_SOURCE_DIR}/cmake/write_manifest.cmake
    VERBATIM)
  set_property(TARGET ${NAME} APPEND PROPERTY LINK_DEPENDS ${P_MANIFEST})
endfunction()
