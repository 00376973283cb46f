"""Capturing traffic: the mitmproxy addon class, the mitmdump launcher and the tenants' upstream stubs."""
