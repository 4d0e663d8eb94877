// model module
