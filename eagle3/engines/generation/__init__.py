"""Generation backends for the generate stage; base.py holds what they and the stage exchange."""
