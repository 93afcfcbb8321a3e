"""Commands around the pipeline that are not stages: planning the hero run, probing a DVC remote."""
