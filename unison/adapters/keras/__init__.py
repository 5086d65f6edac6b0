"""The Keras 3 adapter: DistributedOptimizer and callbacks for any Keras backend; public names live in unison.keras."""
