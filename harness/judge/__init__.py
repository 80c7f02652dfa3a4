"""Running a job and judging it against its cached golden run."""
