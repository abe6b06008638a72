"""Makes course/ a package, so that its conftest.py (which skips Lesson 09 without its files) is imported as
``course.conftest`` and does not shadow ``tests/conftest.py``, which the tests import as ``conftest``."""
