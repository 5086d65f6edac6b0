"""Parameter-server mode: dense parameters and sparse tables held by servers, trained by pulling and pushing."""
