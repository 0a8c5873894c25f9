"""What the DRA driver publishes: ResourceSlices with the standard and our topology attributes (pure), the GPUs'
order in them, and the publisher that keeps them current in the API server."""
