"""Checks that hold rnngrad's reference against implementations written elsewhere.

Run them all with ``python -m verification`` (one table, non-zero exit status on a failure), or
one at a time with ``python -m verification.check_torch`` / ``check_onnx`` /
``check_finite_differences`` / ``check_mpsgraph`` (macOS on Apple silicon only; skipped
elsewhere). ``common`` holds the comparison and table code they share.
"""
