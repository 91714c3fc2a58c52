"""Proofs of losslessness, one Markdown file per method, each step tied to a test (see check.py)."""
