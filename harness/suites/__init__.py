"""Suites built on run-and-judge: scenarios tables, chaos campaigns, sweeps, frameworks rows, the handbook's runs."""
