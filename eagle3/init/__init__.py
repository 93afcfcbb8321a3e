"""`eagle3 init`: a params file for a real run.

In: a shipped hero configuration's name and layout (shipped.py, from eagle3/configs/*.yaml), a shipped one-machine
recipe (recipes.py: from_verifier.py's output on a model's own files, kept in eagle3/configs/verifiers/), or any
verifier's files (from_verifier.py; verifier_files.py reads them). Out: params.yaml, its comments kept (files.py:
the shipped files and the comment-keeping YAML round trip both write).
"""
