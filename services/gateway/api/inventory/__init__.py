"""Inventory: nodes and their BMCs, pools, shapes, images, wipes and GPU quotas."""
