"""Peers measured beside ours on the same model and batches: OpenNMT-py 3.5.1 (opennmt_peer.py)."""
