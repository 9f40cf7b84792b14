"""procgroup over gloo (pygloo): gloo collectives, point-to-point on a host side channel (tcp)."""
