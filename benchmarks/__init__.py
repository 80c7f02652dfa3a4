"""The performance figures users compare trainwreck on."""
