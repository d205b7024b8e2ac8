# The two commands of the README: `make demo` and `make test`. Both install what is missing (Debian bookworm, apt),
# configure and build with CMake (Release), then run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test clean

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

clean:
	rm -rf $(BUILD_DIR)
