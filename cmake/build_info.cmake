# build_info.cmake - writes OUT, a header naming the commit the binaries are
# built from: HEAD of SRC, "+modified" where tracked files differ from it,
# "unknown" without git. Run at every build (the tsr_build_info target);
# the file is rewritten only when its text changes, so only what includes it
# is compiled again. `tessera ablate` records it beside the source tree's
# commit at run time: a binary carried elsewhere (the device) says what it is.
execute_process(COMMAND git -C "${SRC}" rev-parse HEAD OUTPUT_VARIABLE head RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(commit "unknown")
if(rc EQUAL 0 AND head MATCHES "^[0-9a-f]+$")
  set(commit "${head}")
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no OUTPUT_VARIABLE changed
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT changed STREQUAL "")
    set(commit "${commit}+modified")
  endif()
endif()
set(text "/* written by cmake/build_info.cmake at build time */\n#define TSR_BUILD_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
