"""xds-server"""
