"""lookout"""
