"""Adapters that let a framework's own trainer write the run format through the probe,
with no change to the framework. Each one imports its framework; install the extra
(`pip install 'trainwreck[hf]'`) before importing it."""
