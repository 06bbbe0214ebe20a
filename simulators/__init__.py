"""simulators"""
