"""Test helpers shared by the test modules (not tests themselves): ``from helpers.benchjson import
bench``. tests/ is on sys.path because tests/conftest.py is imported from there (pytest's default
"prepend" import mode); rank processes get the controller's sys.path with each task."""
