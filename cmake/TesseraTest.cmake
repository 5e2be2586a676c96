# tessera_add_test(NAME SOURCES src... LIBS libs... [LABELS l...])
# A CMocka test executable run by ctest from the source root, with the
# locations it may need in its environment.
function(tessera_add_test NAME)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${NAME} ${T_SOURCES})
  set_target_properties(${NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/bin)
  target_include_directories(${NAME} PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(${NAME} PRIVATE ${T_LIBS} PkgConfig::CMOCKA)
  if(TESSERA_VALGRIND) # memcheck: invalid accesses, uses of undefined values, definite leaks fail the test
    add_test(NAME ${NAME} COMMAND valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
             --show-leak-kinds=definite --trace-children=yes
             "--trace-children-skip=*/sh,*/bash,*/curl,*/node,*/npm,*/python3*,*/env"
             --quiet $<TARGET_FILE:${NAME}> WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  else()
    add_test(NAME ${NAME} COMMAND ${NAME} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(TESSERA_SANITIZE) # ASan/UBSan run the same work several times slower
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 4")
  endif()
  if(TESSERA_VALGRIND) # and memcheck some tens of times
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 20")
  endif()
  set_tests_properties(${NAME} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "TESSERA_SOURCE_DIR=${CMAKE_SOURCE_DIR};TESSERA_BUILD_DIR=${CMAKE_BINARY_DIR};TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR};TESSERA_CATALOG=${TESSERA_CATALOG_DIR};TESSERA_BIN=${CMAKE_BINARY_DIR}/bin/tessera")
  if(T_LABELS)
    set_tests_properties(${NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# tessera_add_core_lib(NAME LIBS...) - a static library of every .c file in
# the current folder (an area of core/), linked PUBLIC against LIBS.
function(tessera_add_core_lib NAME)
  file(GLOB _src CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  if(NOT _src)
    set(_src ${CMAKE_SOURCE_DIR}/cmake/empty.c) # area not written yet
  endif()
  add_library(${NAME} STATIC ${_src})
  target_include_directories(${NAME} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${NAME} PUBLIC ${ARGN})
endfunction()
