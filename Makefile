# The two commands of the README: `make demo` and `make test`. Both install what is missing (Debian bookworm, apt),
# configure and build with CMake (Release), then run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-asan test-tsan build-clang fuzz clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

demo: build
	$(BUILD_DIR)/tools/sparsereduce-demo --aggregator-bin $(BUILD_DIR)/aggregator/sparsereduce-aggregator

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure --timeout 300 -j$(JOBS)

# Sanitizer builds at -O1 with line tables (-g1), as the sanitizers' documentation suggests: reports keep their file
# and line, and the build takes about half the time of -O2 -g (30 s instead of 60 s for the daemon's session.cc).
# (The scan and reduction kernels keep their own -O3, core/ and codec/CMakeLists.txt, in every build.)
SANITIZER_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO='-O1 -g1 -DNDEBUG'

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	$(MAKE) test BUILD_DIR=build-asan CMAKE_FLAGS="$(SANITIZER_FLAGS) -DSPARSEREDUCE_SANITIZE=address,undefined"

# The threaded parts (daemon with several I/O threads, workers, several Workers per process) under ThreadSanitizer:
# only what the integration label runs is built. Without RDMA (whose tests are not in that label), so CI also
# configures and compiles the build a machine without libibverbs-dev gets: the daemon, the worker library and
# sparsereduce-bw are the code with RDMA-only parts.
test-tsan: deps
	cmake -S . -B build-tsan $(SANITIZER_FLAGS) -DSPARSEREDUCE_SANITIZE=thread -DSPARSEREDUCE_RDMA=OFF
	cmake --build build-tsan -j$(JOBS) --target integration_tests sparsereduce-bw
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" SPARSEREDUCE_TEST_TIME_SCALE=5 \
	  ctest --test-dir build-tsan -L integration --output-on-failure --timeout 300 -j$(JOBS)

# Everything (libraries, daemon, tools, tests) compiled with clang, warnings as errors: users build with either
# compiler. Compiled, not run: the suite runs under g++ above. Unoptimized (no -O, no -g; the kernels keep -O3),
# which compiles fastest; clang's warnings come from its front end, not its optimizer, so they do not depend on the
# level.
build-clang: deps
	bash scripts/install-deps.sh clang
	cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG= -DBUILD_TESTING=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS=-Werror
	cmake --build build-clang -j$(JOBS)

# libFuzzer targets (clang), each run for FUZZ_SECONDS on a copy of its seed corpus.
FUZZ_SECONDS ?= 30
fuzz:
	bash scripts/install-deps.sh clang libclang-rt-14-dev
	bash scripts/run-fuzzers.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD_DIR)
