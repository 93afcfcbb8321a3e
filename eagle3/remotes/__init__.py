"""What crosses machines through DVC: the cache and remote settings the tools read (dvc_settings.py), a timed upload
to a remote (probe.py, for `eagle3 plan --link-from-remote`), and `eagle3 repair` (repair.py: every copy of an output
checked, the intact ones restored).
"""
