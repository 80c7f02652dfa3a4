"""Root conftest: kept thin. Settings and fixtures live in the harness's pytest plugin."""
