"""Development tools: the build backend (backend/) and the man page generator."""
