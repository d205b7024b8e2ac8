# gloo_bench.stopped_run_json (bench/gloo/CMakeLists.txt): a --spawn sweep stopped by --run-timeout part-way exits 1
# and leaves a JSON file that parses, with "complete": false and the rows measured before it was stopped. Rank 0
# wrote the file only at the end of its sweep, and --run-timeout kills the ranks: the file was left empty.
# The sizes: the 4 KiB row ends well within a second of the start; the sweep to 1 GiB (9 iterations a size) took
# 27 s on a 2-core loopback, far beyond the 4 s allowed.
#   cmake -DBENCH=path/to/sparsereduce-gloo-bench -DWORK=scratch-dir -P stopped_json_test.cmake
set(json ${WORK}/gloo_bench_stopped_test.json)
file(REMOVE ${json})
execute_process(COMMAND ${BENCH} --spawn 2 -b 4K -e 1G -f 4 -n 8 -w 1 -c 1 --run-timeout 4 --json ${json}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "exceeded --run-timeout 4 s")
  message(FATAL_ERROR "the sweep to 1 GiB with --run-timeout 4 exited ${rc}, not 1 at the timeout:\n${out}\n${err}")
endif()
file(READ ${json} doc)
string(JSON complete ERROR_VARIABLE json_error GET "${doc}" complete)
if(json_error OR NOT complete STREQUAL "OFF")
  message(FATAL_ERROR "complete: '${complete}' ${json_error}, expected false in the JSON of the stopped run:\n"
                      "'${doc}'\n${out}\n${err}")
endif()
string(JSON rows ERROR_VARIABLE json_error LENGTH "${doc}" results)
if(json_error OR NOT rows GREATER_EQUAL 1)
  message(FATAL_ERROR "${rows} result rows ${json_error}, expected at least the 4 KiB one:\n${doc}\n${out}")
endif()
string(JSON size GET "${doc}" results 0 size)
string(JSON wrong GET "${doc}" results 0 wrong)
string(JSON check_type TYPE "${doc}" check)
if(NOT size EQUAL 4096 OR NOT wrong EQUAL 0 OR NOT check_type STREQUAL "BOOLEAN")
  message(FATAL_ERROR "results[0]: size ${size}, wrong ${wrong} (expected 4096, 0); check is ${check_type}:\n${doc}")
endif()
message(STATUS "stopped after ${rows} rows")
