# libFuzzer targets (LEASH_FUZZ=ON, clang only), included from the top CMakeLists.txt.
# The pure sources are compiled once more into leash_core_fuzz with coverage
# instrumentation (-fsanitize=fuzzer-no-link) plus ASan and UBSan; each target
# tests/fuzz/fuzz_<name>.c links it with libFuzzer's main. cli.c comes with what it calls
# (db.c, log.c, and log.c's secrets.c); a new dependency on another src/ file shows up as an undefined symbol at
# link: add the file here.
#
# ctest (label "fuzz", registered only in this build): fuzz.<name> replays
# tests/fuzz/regressions/<name>/, then fuzzes a scratch copy of tests/fuzz/corpus/<name>/
# for LEASH_FUZZ_SECONDS (tests/fuzz/run.sh does both; it also serves long runs).
set(LEASH_FUZZ_TARGETS enqueue_line json_lua json_encode pgvalue duration provider)
set(LEASH_FUZZ_SECONDS 20 CACHE STRING "Seconds each ctest fuzz.<target> run fuzzes")

set(LEASH_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
add_library(leash_core_fuzz STATIC
  ${CMAKE_SOURCE_DIR}/src/enqueue.c ${CMAKE_SOURCE_DIR}/src/json_lua.c
  ${CMAKE_SOURCE_DIR}/src/pgvalue.c ${CMAKE_SOURCE_DIR}/src/cli.c
  ${CMAKE_SOURCE_DIR}/src/db.c ${CMAKE_SOURCE_DIR}/src/log.c ${CMAKE_SOURCE_DIR}/src/buf.c
  ${CMAKE_SOURCE_DIR}/src/luatext.c ${CMAKE_SOURCE_DIR}/src/provider.c
  ${CMAKE_SOURCE_DIR}/src/secrets.c)
target_include_directories(leash_core_fuzz PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_compile_options(leash_core_fuzz PRIVATE ${LEASH_WARNINGS}
                       PUBLIC -fsanitize=fuzzer-no-link ${LEASH_FUZZ_SAN})
# the same libraries as leash_core (cli.c's --version names libcurl's and libmicrohttpd's)
get_target_property(LEASH_CORE_LIBS leash_core LINK_LIBRARIES)
target_link_libraries(leash_core_fuzz PUBLIC ${LEASH_CORE_LIBS})

add_custom_target(fuzz)
foreach(name ${LEASH_FUZZ_TARGETS})
  add_executable(fuzz_${name} ${CMAKE_CURRENT_LIST_DIR}/fuzz_${name}.c)
  target_compile_options(fuzz_${name} PRIVATE ${LEASH_WARNINGS} -fsanitize=fuzzer)
  target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer ${LEASH_FUZZ_SAN})
  target_link_libraries(fuzz_${name} PRIVATE leash_core_fuzz)
  add_dependencies(fuzz fuzz_${name})
  add_test(NAME fuzz.${name}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run.sh ${name} ${LEASH_FUZZ_SECONDS})
  math(EXPR timeout "${LEASH_FUZZ_SECONDS} + 120")
  set_tests_properties(fuzz.${name} PROPERTIES LABELS "fuzz" TIMEOUT ${timeout}
    ENVIRONMENT "LEASH_FUZZ_BIN=$<TARGET_FILE:fuzz_${name}>;LEASH_FUZZ_WORK=${CMAKE_BINARY_DIR}/fuzz-work")
endforeach()
