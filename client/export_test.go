package client

// Queued returns how many GetInto Acquires, PutFrom Reserves and PutFrom
// Commits of c wait behind a call in flight.
func Queued(c *Client) (acquire, reserve, commit int) {
	return c.zc.acquires.queued(), c.zc.reserves.queued(), c.zc.commits.queued()
}

// WaitFor polls cond until it holds or a deadline passes (the package's
// test helper, for the external tests).
var WaitFor = waitFor
