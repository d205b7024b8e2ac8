# Unit tests of the codec layer: byte coding, frames, block scan, layout, reduction and copy kernels.
# Included from tests/unit/CMakeLists.txt. One executable per test file.
include(GoogleTest)

foreach(sparsereduce_codec_test IN ITEMS coding_test frame_test block_scan_test layout_test reduce_kernels_test
        streaming_copy_test
        buffer_pool_test control_spec_test status_test)

  add_executable(${sparsereduce_codec_test} ${CMAKE_CURRENT_SOURCE_DIR}/${sparsereduce_codec_test}.cc)
  target_link_libraries(${sparsereduce_codec_test} PRIVATE sparsereduce_protocol GTest::gtest_main)
  gtest_discover_tests(${sparsereduce_codec_test} DISCOVERY_TIMEOUT 60)
endforeach()

add_executable(byte_ring_test ${CMAKE_CURRENT_SOURCE_DIR}/byte_ring_test.cc)
target_link_libraries(byte_ring_test PRIVATE sparsereduce_transport_shm GTest::gtest_main)
gtest_discover_tests(byte_ring_test DISCOVERY_TIMEOUT 60)
