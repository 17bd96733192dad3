# All metadata lives in pyproject.toml; setup.py exists only because pyproject cannot
# declare cffi_modules (python-cffi/cffi#55). Imported first so that a build environment
# without cffi fails here instead of skipping the extension with a warning.
import cffi  # noqa: F401
from setuptools import setup

setup(cffi_modules=["native/build_collate.py:ffibuilder"])
