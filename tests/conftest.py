"""Shared test configuration: the tenancy pytest plugin is loaded through its entry point."""
