"""One module per page of the explorer; each has a render() function."""
