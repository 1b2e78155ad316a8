"""Renders a SAM template through the SAM transform offline, as cfn-lint does, and prints the
resulting CloudFormation template as JSON. Usage: python3 render_sam.py template.yaml

Like cfn-lint, it points every local CodeUri at a placeholder S3 object (the transform wants one)
and resolves no managed policy names (the template uses none)."""
import json
import os
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    def load(self):
        return {}


def main(path):
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    template = yaml_parse(open(path).read())
    for name, res in list(template.get("Resources", {}).items()):
        if res.get("Type") == "AWS::Serverless::Function":
            res.setdefault("Properties", {})["CodeUri"] = "s3://placeholder-bucket/" + name
    template.get("Globals", {}).get("Function", {}).pop("CodeUri", None)
    json.dump(transform(template, {}, NoManagedPolicies()), sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
