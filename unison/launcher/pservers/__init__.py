"""``unisonrun --pservers N``: where the parameter servers run, and starting and watching them beside the trainers."""
