"""Typed parameter sections, one module per stage, so a stage's DVC deps name only its own section."""
