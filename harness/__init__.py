"""tenancy-audit: prove that a multi-tenant agent keeps every tenant's secrets to itself."""

__version__ = "0.1.0"
