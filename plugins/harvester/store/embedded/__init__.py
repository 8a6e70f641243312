"""store/embedded"""
