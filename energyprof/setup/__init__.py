"""Every user-facing option and its pure validation, shared by the command line and the API."""
