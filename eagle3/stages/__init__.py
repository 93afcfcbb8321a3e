"""One module per DVC stage, named as in dvc.yaml: each defines `Params` (the params.yaml sections it reads) and
`run(params, root, options)`. stages/<name>.py at the project root is the entry point DVC runs."""
