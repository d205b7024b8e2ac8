# Install layout and the Debian package (`cpack -G DEB` in the build directory), included from the top-level
# CMakeLists.txt after the targets exist. aggregator/, worker/ and tools/ install their own binaries, the static
# worker library and the headers; this file adds what a package needs around them.
include(CMakePackageConfigHelpers)

# --- Worker library for users: libsparsereduce.so -----------------------------------------------------------
# The static sparsereduce_worker cannot be exported as it is: it needs the internal static libraries (transport,
# protocol, core, generated protobuf code) whose include directories point into the source tree. The shared
# library links them in and exports only the public API (libsparsereduce.map); its run-time needs (libstdc++,
# libprotobuf, ...) become Depends through dpkg-shlibdeps.
# Its objects are the static library's; linking that library too brings in its (private) dependencies.
add_library(sparsereduce_shared SHARED $<TARGET_OBJECTS:sparsereduce_worker>)
target_link_libraries(sparsereduce_shared PRIVATE sparsereduce_worker PUBLIC Threads::Threads)
target_include_directories(sparsereduce_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/worker/include> $<INSTALL_INTERFACE:include>)
target_link_options(sparsereduce_shared PRIVATE -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/libsparsereduce.map)
# A missing dependency fails here, not in the user's link. (Not with sanitizers: clang leaves their runtime
# symbols undefined in shared libraries.)
if(NOT SPARSEREDUCE_SANITIZE AND NOT SPARSEREDUCE_FUZZ)
  target_link_options(sparsereduce_shared PRIVATE -Wl,--no-undefined)
endif()
set_target_properties(sparsereduce_shared PROPERTIES
  OUTPUT_NAME sparsereduce
  EXPORT_NAME worker
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libsparsereduce.map)

install(TARGETS sparsereduce_shared EXPORT sparsereduceTargets
  LIBRARY DESTINATION lib
  INCLUDES DESTINATION include)

# find_package(sparsereduce) -> sparsereduce::worker, the same name as inside this build.
install(EXPORT sparsereduceTargets NAMESPACE sparsereduce:: DESTINATION lib/cmake/sparsereduce)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/sparsereduceConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/sparsereduceConfig.cmake
  INSTALL_DESTINATION lib/cmake/sparsereduce)
# 0.x: minor versions may break the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/sparsereduceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sparsereduceConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/sparsereduceConfigVersion.cmake
  DESTINATION lib/cmake/sparsereduce)

# --- Tools users run (aggregator, perf and bw install themselves) -------------------------------------------
# The demo finds sparsereduce-aggregator next to itself, so it works from /usr/bin as it does from the build.
install(TARGETS sparsereduce-demo RUNTIME DESTINATION bin)

# --- Service files ------------------------------------------------------------------------------------------
set(SPARSEREDUCE_DEPLOY_DIR ${PROJECT_SOURCE_DIR}/deploy)
install(FILES ${SPARSEREDUCE_DEPLOY_DIR}/systemd/sparsereduce-aggregator.service DESTINATION lib/systemd/system)
install(FILES ${SPARSEREDUCE_DEPLOY_DIR}/systemd/sparsereduce.sysusers
  DESTINATION lib/sysusers.d RENAME sparsereduce.conf)
# Debian policy: configuration lives in /etc and is a conffile (listed in deploy/debian/conffiles), so local
# edits survive upgrades. The unit's ExecStart reads it from there. An absolute path, so `cmake --install` writes
# /etc whatever the prefix: stage such installs with DESTDIR.
install(FILES ${SPARSEREDUCE_DEPLOY_DIR}/config/aggregator.toml DESTINATION /etc/sparsereduce)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/OPERATIONS.md
  ${PROJECT_SOURCE_DIR}/docs/SECURITY.md ${PROJECT_SOURCE_DIR}/docs/PROTOCOL.md
  DESTINATION share/doc/sparsereduce)

# --- Debian package -----------------------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME sparsereduce)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(SPARSEREDUCE_PACKAGE_MAINTAINER "sparsereduce maintainers <maintainers@users.noreply.a-seed-940bc419.example>"
  CACHE STRING "Maintainer field of the Debian package")
set(CPACK_PACKAGE_CONTACT "${SPARSEREDUCE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "sparse allreduce for distributed training: aggregator daemon and worker library")
# Long description: lines below 80 columns, as dpkg shows them.
string(JOIN "\n" CPACK_PACKAGE_DESCRIPTION
  "sparsereduce sums sparse gradients across training processes through aggregator"
  "daemons, moving only the nonzero blocks (OmniReduce-style)."
  "This package contains the aggregator daemon with its systemd unit, the worker"
  "library with its headers and CMake package, and the perf, bw and demo tools.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends is computed by dpkg-shlibdeps from the ELF files (libc6, libstdc++6, libprotobuf32, ...).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The Python module (when built) is for one interpreter version; Recommends, not Depends: the daemon needs no Python
# (the image installs without recommends).
get_property(sparsereduce_python_version GLOBAL PROPERTY SPARSEREDUCE_PYTHON_VERSION)
if(sparsereduce_python_version MATCHES "^([0-9]+)\\.([0-9]+)$")
  math(EXPR sparsereduce_python_next "${CMAKE_MATCH_2} + 1")
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
    "python3 (>= ${sparsereduce_python_version}), python3 (<< ${CMAKE_MATCH_1}.${sparsereduce_python_next})")
  set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch")
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${SPARSEREDUCE_DEPLOY_DIR}/debian/conffiles
  ${SPARSEREDUCE_DEPLOY_DIR}/debian/triggers
  ${SPARSEREDUCE_DEPLOY_DIR}/debian/postinst
  ${SPARSEREDUCE_DEPLOY_DIR}/debian/prerm
  ${SPARSEREDUCE_DEPLOY_DIR}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

# Tests of all this (labels deploy and package). Not in sanitizer builds: they check the release artefacts, and a
# package of instrumented binaries would not even load into an uninstrumented consumer.
if(BUILD_TESTING AND NOT SPARSEREDUCE_SANITIZE)
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/deploy ${PROJECT_BINARY_DIR}/tests/deploy)
endif()
