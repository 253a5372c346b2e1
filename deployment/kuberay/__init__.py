"""KubeRay: a RayService manifest from the Ray Serve config the tuner writes, validated offline."""
