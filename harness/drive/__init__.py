"""Driving Hermes: tenant homes and hermetic children, the backends, the scenario drivers and the plants."""
