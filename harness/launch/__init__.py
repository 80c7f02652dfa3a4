"""Launching ranks: processes, the fork server, the rendezvous store, the rank entry and the --cmd rank faults."""
