"""`unison.run`: call a Python function on N processes: its options, the launch, and the program each rank runs."""
