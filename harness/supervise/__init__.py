"""Supervising one job: its spec and target, attempts and restarts, the watchdogs, torchrun and replica groups."""
