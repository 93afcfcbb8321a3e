"""The pieces of training the train stage and the benchmarks share: objective and step, data, processes, logs."""
