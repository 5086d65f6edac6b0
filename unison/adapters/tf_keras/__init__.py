"""The Keras 2 adapter (tf_keras, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``): DistributedOptimizer, callbacks, load_model."""
