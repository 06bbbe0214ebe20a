"""engine/spark"""
