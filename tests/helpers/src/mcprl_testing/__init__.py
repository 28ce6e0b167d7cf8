"""Helpers shared by the test suite (installed editable by ``make setup``; no service or
image depends on it): checks, fakes and fixtures-to-be, one module per package tested."""
