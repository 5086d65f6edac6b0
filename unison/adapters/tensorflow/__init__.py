"""The TensorFlow adapter: collectives on tf tensors (eager and tf.function), tapes, helpers; public names live in unison.tensorflow."""
