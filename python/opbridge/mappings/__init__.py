"""Export rules for ops that torch or torchvision own, one module per op or family.

``import opbridge`` imports every module here (those whose names start with an
underscore are helpers); each registers its specs (:mod:`opbridge.specs`).
"""
