"""procgroup over gloo (pygloo): gloo collectives, point-to-point on a TCP side channel."""
