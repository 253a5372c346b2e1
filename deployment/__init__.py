"""Past one machine: the image recipe, Kubernetes and KServe manifests, and the replica plan,
all generated from config.properties and the mix record the tuner wrote into it.

    python -m deployment              # write deploy/ (make deploy)
    python -m deployment --rate 900   # size replicas for 900 req/s (make plan RATE=900)
    python -m deployment --check      # validate deploy/ offline against the schemas

Nothing imports this package; it imports serving.*, serving.mix_record and build.
"""
