"""Imported first by the torch tests: without torch they must fail with a clear message, not be skipped."""

import pytest

try:
    import torch  # noqa: F401
except ImportError as e:
    pytest.fail(f"these tests need PyTorch for /usr/bin/python3 (Debian python3-torch; scripts/install-deps.sh "
                f"installs it): {e}", pytrace=False)
